"""elasticslice.emulator"""
