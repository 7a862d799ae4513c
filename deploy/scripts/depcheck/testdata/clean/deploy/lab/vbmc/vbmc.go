package vbmc
