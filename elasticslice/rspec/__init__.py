"""elasticslice.rspec"""
