"""Seeing the tables: their figures for ``/metrics``, a short history, and the ``/status`` page.

:mod:`.collector` turns each table's ``Table.stats`` into Prometheus families
at scrape time; :mod:`.history` keeps a bounded ring of recent figures per
table; :mod:`.routes` serves the page (a public shell of bundled assets, no
data) and ``GET /v1/status``, the token-guarded JSON the page polls.
"""
