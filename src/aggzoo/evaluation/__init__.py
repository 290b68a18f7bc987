"""Retrieval evaluation: extract descriptors with a model, search them (``retrieval``: one index
interface, FAISS exact or approximate with a torch fallback for tiny sets), post-process them
(PCA-whitening, SuperGlobal reranking), compute Recall@k, and write reports (table, JSON, Markdown,
pictures) and MSLS submission files; ``benchmarks`` evaluates one model on many benchmark configs,
``protocol`` holds the published evaluation resize. It sits above :mod:`aggzoo.models` and
:mod:`aggzoo.data` (a model run over a :class:`~aggzoo.data.retrieval_set.RetrievalSet`) and below
:mod:`aggzoo.training` (validation is Recall@k) and :mod:`aggzoo.run`.
"""
