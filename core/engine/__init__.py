"""hyspec.engine"""
