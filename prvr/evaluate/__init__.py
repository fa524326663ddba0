"""Evaluation: the official retrieval protocol on a trained model (``retrieval``), the app's search path on
annotated video sets (``annotated``; the demo gallery as one: ``demo``). Command line: ``__main__``."""
