"""The daemons' options: their value types (`types`) and the one declaration of each option
(`declared`), from which the command line, the options objects and the chart's values schema are made."""
