"""What the operator and the cache servers share, owned by neither: the gRPC protocol
(proto/), the errors a call answers with, sizes and durations, the names and numbers both
sides rely on (ports, environment variables, Secret keys, the CRD group), the schema of the
servers' `strata.yaml` that the operator renders, the read and write types, and the client
side of gRPC: channels that carry the token and the mapping of failed calls to errors (rpc),
and the asyncio master client of the operator, the workers and the CLI (master).

Both strata.cacheserver and strata.operator import this package; it imports neither."""
