"""hyspec.train"""
