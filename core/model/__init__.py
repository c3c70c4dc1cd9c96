"""hyspec.model"""
