module corral.dev/exec

go 1.26
