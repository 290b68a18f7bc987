"""Datasets in their real on-disk formats (VG, npy lists, MSLS, VPR-Bench, a folder + CSV of your own
images, GSV-Cities for training), the :class:`~aggzoo.data.retrieval_set.RetrievalSet` every
evaluation format loads into, image reading with its policy for unreadable files, albumentations
transforms, and the embedded synthetic city (the default dataset). Of aggzoo it imports only
:mod:`aggzoo.errors`; :mod:`aggzoo.evaluation` and :mod:`aggzoo.training` read from it.
"""
