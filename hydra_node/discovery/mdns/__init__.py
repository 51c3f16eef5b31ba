"""mDNS on the LAN: the `_hydra._tcp.local.` record codec (`wire`, sans-IO), the table of what
was heard (`table`), the trio multicast service (`service`) and a standalone probe (`probe`)."""
