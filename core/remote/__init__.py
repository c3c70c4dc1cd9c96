"""hyspec.remote"""
