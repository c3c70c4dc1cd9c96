"""hyspec.spec"""
