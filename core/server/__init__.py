"""hyspec.server"""
