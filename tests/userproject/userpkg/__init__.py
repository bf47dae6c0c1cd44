"""A user's own package, trained through attnlab without editing it (see README.md, "Your own code")."""
