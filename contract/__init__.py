"""What the operator and the cache servers share, owned by neither: the gRPC protocol
(proto/), the errors a call answers with, sizes and durations, the names and numbers both
sides rely on (ports, environment variables, Secret keys, the CRD group), the schema of the
servers' `strata.yaml` that the operator renders, and the read and write types.

Both strata.cacheserver and strata.operator import this package; it imports neither."""
