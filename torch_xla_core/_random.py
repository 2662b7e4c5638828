"""Device random numbers (placeholder until the RNG ops land)."""
_seed = 0


def manual_seed(seed: int) -> None:
    global _seed
    _seed = int(seed)
