"""How :class:`~cape.models.CellTransformer` trains its modules.

* :mod:`~cape.models.training.engine` — :class:`~cape.models.TrainingPlan` (how to optimise, validate and stop) and
  the :class:`~cape.models.training.engine.Trainer` that runs it;
* :mod:`~cape.models.training.objectives` — the task modules and losses of pretraining and annotation;
* :mod:`~cape.models.training.distributed` — DDP under ``torchrun``.
"""
