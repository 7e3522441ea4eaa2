"""The CSI plugin of driver csi.strata.dev (`strata csi`): pods get Strata data as volumes.

server.py runs the gRPC server, service.py holds the Identity, Node and Controller services,
volumes.py turns volume attributes into a cluster and path, kube.py reads Mounts from the
Kubernetes API, publisher.py runs one FUSE process per published volume. proto/csi.proto is
the part of the CSI v1 spec served here.
"""
