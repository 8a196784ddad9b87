"""Keras training for one hop: build a configuration, restore and save its state, train, evaluate, export.

Only workers import the submodules (they import Keras): ``builder`` (import path to compiled model),
``checkpoint`` (model and optimizer state as bytes) and ``hop`` (batch order, train, evaluate, export).
This package itself imports nothing, so DAG files stay cheap to parse.
"""
