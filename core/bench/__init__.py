"""hyspec.bench"""
