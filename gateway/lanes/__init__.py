"""Priority lanes on Redis: the typed messages and the key names both sides share, the gateway's client."""
