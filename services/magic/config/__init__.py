"""Typed configuration, each setting declared once: the run schema (`schema.py`: RunSpec,
StageConfig — the paper's symbols are mapped there), the settings every process shares
(`settings.py`; each service's own settings live next to it), CLI flags generated from the schema
(`flags.py`), and registries of functions chosen by a config value's name (`registry.py`)."""
