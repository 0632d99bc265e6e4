"""Running deployments: the one builder (``builder.start_cluster``), the specs it takes
(``spec``), worker processes (``worker``), their supervision (``supervisor``, ``procs``) and
the Python API (``api.Cluster``)."""
