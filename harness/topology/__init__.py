"""Topology ids and constraints, megatron rank coordinates, the collision oracle and map."""
