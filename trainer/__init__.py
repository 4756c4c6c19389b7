"""freescale.trainer: the compact torchrun trainer that consumes what ``freescale prepare`` writes.

Public API (import from the submodules; this package imports nothing heavy on its own):

- ``config.RunConfig`` — the run config (TOML tables ``[model]`` … ``[logging]``), validated on load;
- ``launch.launch(config, nproc, device, overrides)`` — what ``freescale train`` runs (torchrun);
- ``runner.main(cfg)`` / ``runner.Trainer`` — one rank's loop (``python -m freescale.trainer``);
- ``engine.FreeScaleEngine`` — sharded tables + data-parallel dense model, seven explicit stages;
- ``torchrec_engine.TorchRecEngine`` — the vanilla TorchRec baseline (``engine.name = "torchrec"``);
- ``model.SequentialTransducer`` (HSTU / SASRec), ``model.sampled_softmax_loss``;
- ``sharded.RowWiseShardedTables`` — input_dist / lookup / output_dist / grad_dist / sparse_update;
- ``instrument.StepTimer``, ``bubbles.analyze`` / ``summarize`` — straggler / exposed-comm split;
- ``evaluate.evaluate`` (HR@k, NDCG@k), ``checkpoint.FreeScaleCheckpointer`` (DCP),
  ``reference.ReferenceTrainer`` (single-process replay), ``calibrate.calibrate`` (fitted cost model).
"""
