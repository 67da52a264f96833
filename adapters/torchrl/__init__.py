"""TorchRL integration: a replay buffer whose storage and sampler live in a tdreplay server."""
