"""Studies: they drive the Flower apps (in process, or under ``flwr run``) and the numeric
core, and write the tables: the bench (:mod:`~fedqhd.studies.bench`), the FedQHD paper's
table (:mod:`~fedqhd.studies.paper`), the scale suite (:mod:`~fedqhd.studies.scale`,
:mod:`~fedqhd.studies.perf`), the paper's federation-gap ablations
(:mod:`~fedqhd.studies.federation_gap`) and POOL's studies and audit
(:mod:`~fedqhd.studies.pool_experiments`, :mod:`~fedqhd.studies.pool_audit`), and the
audit's neighbours for private FedQHD (:mod:`~fedqhd.studies.fedqhd_audit`)."""
