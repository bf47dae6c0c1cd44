"""A job's life on a cluster: how each attempt ends, and whether it goes on.

What happens when...
- **a job is preempted or nears its time limit.** SLURM warns (`--signal=USR1@<lead>`, which `launcher=slurm` asks
  for; under PreemptMode=REQUEUE, a SIGTERM while the job has a PreemptTime). Every rank ends the current step
  together (or the current validation batch), `last.ckpt` is saved at it, and rank 0 decides the cause from what
  `scontrol show job` says: `time limit` when the warning came within the lead of the job's EndTime, else
  `preempted`; in a batch script of one's own, `SLURM's warning`. Time limits count against
  `launcher.max_num_timeout`; preemptions do not. Within the budget the job is requeued (through submitit's handler
  under launcher=slurm, else `scontrol requeue`) and continues from `last.ckpt` in its own folder; past it, or when
  SLURM refuses (`--no-requeue`, PreemptMode=CANCEL), it is not, and says why. Either way the attempt exits 143.
  The SIGTERMs of the end the warning announced (srun's and the step's) leave the save to finish, unless a step has
  run for `patience_s`.
- **a job is killed (scancel, kill).** The first SIGTERM saves `last.ckpt` after the current step and exits 143; a
  second one, or the first after a step has run for `patience_s`, ends the process at once, naming the last
  checkpoint. Nothing is requeued. (Ctrl-C is Lightning's: `last.ckpt` saved where it stopped, exit status 1.)
- **a node or a rank is lost.** The other ranks learn it from their next collective. A rank that fails on an error of
  its own leaves a note first (`.ranks/`), so a survivor tells a failed peer (the run fails: a bug comes back) from a
  lost one. A lost peer in a SLURM job requeues it, at most `launcher.max_num_timeout` times; once that budget is
  spent, the job is made non-requeueable and fails with status 1, saying why.

Every attempt of a SLURM job has one record in the run folder's ledger (`.requeues/<job>.<restart count>.json`),
written before any requeue is asked for; the ranks count the budgets from the same files, whichever rank was lost.
How an attempt ended is an `Outcome` (outcome.py) in the run's lineage, which the sweep driver of `launcher=slurm`
reads (sweep_watch.py).
"""
