"""Checkpoints and run folders, above all those from elsewhere: finding and reading them (`reading`), what a file may
make attnlab build (`trust`), sharded folders read whole (`sharded`), the restricted unpickler for plain pickles
(`safe_pickle`), and what a run continues from (`resume`)."""
