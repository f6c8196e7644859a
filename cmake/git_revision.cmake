# Run at every build (not only at configure time): writes OUT, a header defining
# LOCALPAR_GIT_REVISION as the source tree's short revision ("-dirty" when tracked files
# differ from it), and rewrites it only when that changes, so an unchanged tree rebuilds
# nothing.
execute_process(COMMAND git -C ${SRC} rev-parse --short=12 HEAD
                OUTPUT_VARIABLE rev OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT rev)
  set(rev unknown)
else()
  execute_process(COMMAND git -C ${SRC} status --porcelain --untracked-files=no
                  OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(changes)
    set(rev "${rev}-dirty")
  endif()
endif()
file(WRITE ${OUT}.tmp "#define LOCALPAR_GIT_REVISION \"${rev}\"\n")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different ${OUT}.tmp ${OUT})
file(REMOVE ${OUT}.tmp)
