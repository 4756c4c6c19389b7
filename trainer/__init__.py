"""freescale.trainer: the compact torchrun trainer that consumes what ``freescale prepare`` writes.

Folders by role: ``engines/``, ``model/``, ``data/``, ``eval/``, ``metrics/``, ``simulate/`` (never imported by
training); launcher, runner, config and checkpoints at the top.

Public API (import from the submodules; this package imports nothing heavy on its own):

- ``config.RunConfig`` — the run config (TOML tables ``[model]`` … ``[logging]``), validated on load;
- ``launch.launch(config, nproc, device, overrides)`` — what ``freescale train`` runs (torchrun);
- ``runner.main(cfg)`` / ``runner.Trainer`` — one rank's loop (``python -m freescale.trainer``);
- ``engines.engine.FreeScaleEngine`` — sharded tables + data-parallel dense model, seven explicit stages;
- ``engines.torchrec_engine.TorchRecEngine`` — the vanilla TorchRec baseline (``engine.name = "torchrec"``);
- ``model.transducer.SequentialTransducer`` (HSTU / SASRec), ``model.transducer.sampled_softmax_loss``;
- ``engines.sharded.RowWiseShardedTables`` — input_dist / lookup / output_dist / grad_dist / sparse_update;
- ``metrics.instrument.StepTimer``, ``metrics.bubbles.analyze`` / ``summarize`` — straggler / exposed-comm split;
- ``eval.evaluate.evaluate`` (HR@k, NDCG@k), ``checkpoint.FreeScaleCheckpointer`` (DCP),
  ``reference.ReferenceTrainer`` (single-process replay), ``simulate.calibrate.calibrate`` (fitted cost model);
- ``engines.registry.make_engine`` — ``engine.name`` -> engine factory.
"""
