"""Ray AIR's import paths, for scripts written for Ray: ``ftnb.air.integrations.mlflow`` and
``ftnb.air.integrations.wandb`` (each imports its package only when used)."""
