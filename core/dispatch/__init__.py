"""hyspec.dispatch"""
