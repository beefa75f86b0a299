"""The admin API's routes, one module per resource."""
