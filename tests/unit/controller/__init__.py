"""The controller (gpudra.controller): the webhook and its certificates, leader election, /status, the GPU
map."""
