"""tdreplay.client (under construction)."""
