"""Tests of the embedding job (clip_flash.jobs); a package so its conftest never shadows another."""
