"""hyspec.drafters"""
