"""hyspec.kv"""
