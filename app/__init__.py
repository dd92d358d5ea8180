"""The application: the ``Pipeline`` API, the generation engine, checkpoint loading, the ``generate`` command and
the model families (``families/``)."""
