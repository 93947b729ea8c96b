"""elasticslice.managers"""
