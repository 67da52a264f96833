"""tdreplay.service (under construction)."""
