"""The vocabulary the servers and the client share, and nothing else of either side: namespace
paths (`paths`), block keys (`keys`) and their wire form (`blockrefs`), block checksums
(`checksums`), the block transfer protocol (`blockwire`), durable writes of local files
(`durable`) and values by path that forget a tree at once (`pathmap`). The client and the
FUSE mount, which users install in their pods, import these and none of the server's modules
(master, worker, namespace, cache, store access).
"""
