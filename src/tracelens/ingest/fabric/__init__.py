"""Fabric dumps: port counters (perfquery, ethtool -S, RDMA hw_counters) and port status (ibstat,
ibstatus, ibv_devinfo); `dumps` and `ports` hold what they share."""
