"""Converters from the authors' released checkpoints to aggzoo's key names, one file per upstream
method. Each is a named function ``(state_dict, model) -> state_dict`` registered as the ``remap`` of
its ``<name>.official`` weights; the result is loaded strictly."""
