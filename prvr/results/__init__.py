"""From a query to what a person sees: the query text checked (``query``), ranked evidence turned into
result dicts (``response``) with moments and heatmaps (``moments``) and a confidence label
(``confidence``), all behind one search path (``search``)."""
