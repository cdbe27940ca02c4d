module kuryr-cni/shim

go 1.19
