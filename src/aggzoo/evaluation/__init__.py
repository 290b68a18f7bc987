"""Retrieval evaluation, one small module per job, each stage taking one frozen options object
(:mod:`.options`):

- :mod:`.extraction` -- images -> ``[N, D]`` descriptors (batches, workers, memory-mapped store);
  :mod:`.binary_codes` -- a model's hashing branch as codes for a binary first stage;
- :mod:`.index` -- FAISS indexes: exact, approximate, two-stage (an approximate shortlist re-scored exactly);
  :mod:`.search` -- top-k search over them (torch fallback without FAISS, ties by index);
- :mod:`.metrics` -- Recall@k (place recognition), mAP / mP@k (revisited Oxford/Paris), MAP@R / R-Precision
  (metric learning);
  :mod:`.result` -- one benchmark's result and the metrics its ground truth asks for;
- :mod:`.test_time` -- model transforms (TLC, multi-scale), PCA-whitening, re-rankers from options;
  :mod:`.postprocess`, :mod:`.late_interaction`, :mod:`.local_rerank` -- the re-rankers themselves;
- :mod:`.loop` -- one benchmark: extract -> search -> re-rank -> metrics; :mod:`.benchmarks` -- many, with the
  report (:mod:`.report`: tables, JSON, Markdown, pictures; :mod:`.submission`: MSLS files);
- :mod:`.protocol` -- the model's evaluation protocol (size, resize, normalisation); :mod:`.unlabelled` and
  :mod:`.place_search` -- retrieval without ground truth (predictions files, the demo).

It sits above :mod:`aggzoo.models` and :mod:`aggzoo.data` (a model run over a
:class:`~aggzoo.data.retrieval_set.RetrievalSet`) and below :mod:`aggzoo.training` (validation is Recall@k) and
:mod:`aggzoo.run` (which builds the options from the config; nothing here reads a config).
"""
