"""The tables of the docs that are measured rather than written: the envs, ALFWorld's games, TextArena's games."""
