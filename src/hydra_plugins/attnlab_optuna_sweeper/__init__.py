"""attnlab's Hydra sweeper for Optuna (hydra/sweeper=optuna): studies kept in SQLite that a second run of the same
command continues. It lives in Hydra's `hydra_plugins` namespace, where Hydra looks for plugins."""
