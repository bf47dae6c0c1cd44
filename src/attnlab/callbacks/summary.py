"""Lightning's RichModelSummary with the FLOPs a task really takes, for a task without an `example_input_array`: the
total is one training sample's forward pass and loss (the task's step on the first sample of the first training
batch, counted by torch's FlopCounterMode), and the per-layer FLOPs column reads "—"."""

from __future__ import annotations

from lightning.pytorch.callbacks import RichModelSummary

NOT_COUNTED = "—"


class ModelSummary(RichModelSummary):
    _flops: int | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        self._flops = None
        dm = getattr(trainer, "datamodule", None)
        if trainer.is_global_zero and pl_module.example_input_array is None and dm is not None:
            from attnlab.memory import sample_batch
            from attnlab.traced_step import step_flops

            try:
                batch = sample_batch(dm)
            except Exception:  # a data module without a map-style training loader: no count
                batch = None
            self._flops = step_flops(pl_module, batch) if batch is not None else None
        super().on_fit_start(trainer, pl_module)

    def summarize(self, summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                  total_flops, **summarize_kwargs) -> None:
        if self._flops is not None:
            summary_data = [(name, [NOT_COUNTED] * len(values) if name == "FLOPs" else values)
                            for name, values in summary_data]
            total_flops = self._flops
        super().summarize(summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                          total_flops=total_flops, **summarize_kwargs)
