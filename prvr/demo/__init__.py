"""The demo gallery the app shows on first start: its recipe and cache (``gallery``) and its rendering
(``compose``, from the real clips of ``clips``). ``python -m prvr.demo`` builds it."""
