"""The secure-aggregation bench, one module per section; ``bench/bench_secagg.py`` is the front door
(its command line and output). Rounds run through :func:`secfed.protocols.drive`, the protocol's own
phase driver, and are timed through its ``on_step`` hook."""
