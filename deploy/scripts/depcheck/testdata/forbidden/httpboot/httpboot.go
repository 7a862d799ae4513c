package httpboot
