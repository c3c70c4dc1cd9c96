"""EAGLE and EAGLE-3: a one-layer head on target features, dynamic draft trees."""
