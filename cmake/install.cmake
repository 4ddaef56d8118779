# What `cmake --install` puts under the prefix, and cpack's Debian package of the same:
#   bin/xla-spawn
#   lib/libxla_spawn_*.a, the libraries of xs_library() (CMakeLists.txt)
#   include/xla_spawn/<layer>/..., their headers, included as "xla_spawn/<layer>/..."
#   lib/cmake/xla_spawn/, the CMake package: find_package(xla_spawn CONFIG), targets
#     xla_spawn::base, ::cluster, ::store_client, ::shm, ::collectives, ::runtime, ::replica,
#     ::xm (the training API; links the rest), ::launcher (spawn(fn) and the supervisor)
#   lib/pkgconfig/xla_spawn.pc, the same for builds without CMake
#   share/man/man1/xla-spawn.1 and share/bash-completion/completions/xla-spawn
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(xs_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/xla_spawn)
get_property(xs_libraries GLOBAL PROPERTY XS_LIBRARIES)
install(TARGETS ${xs_libraries} EXPORT xla_spawn_targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS xla-spawn RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
foreach(layer ${XS_LAYERS})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${layer}/
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/xla_spawn/${layer}
          FILES_MATCHING PATTERN "*.h" PATTERN "*.def")
endforeach()

install(EXPORT xla_spawn_targets NAMESPACE xla_spawn:: FILE xla_spawnTargets.cmake
        DESTINATION ${xs_cmake_dir})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/xla_spawnConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/xla_spawnConfig.cmake
                              INSTALL_DESTINATION ${xs_cmake_dir})
# 0.x: a minor version may break the interface.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/xla_spawnConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/xla_spawnConfig.cmake
              ${PROJECT_BINARY_DIR}/xla_spawnConfigVersion.cmake
        DESTINATION ${xs_cmake_dir})

# pkg-config: the prefix is found from the .pc file's own place, so the tree can move (a DEB
# unpacked into a scratch root works as installed). The runtime's private libraries are the
# files CMake found (Debian's paths), as the static libraries need them at the consumer's link.
file(RELATIVE_PATH xs_pc_to_prefix /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" xs_pc_to_prefix "${xs_pc_to_prefix}")
set(xs_pc_private_libs "${XS_OPENBLAS_LIBRARY} ${XS_DNNL_LIBRARY} ${XS_GOMP_LIBRARY} ${XS_LLVM_LIBRARY}")
if(XS_SANITIZE)
  string(APPEND xs_pc_private_libs " -fsanitize=${XS_SANITIZE}")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/xla_spawn.pc.in ${PROJECT_BINARY_DIR}/xla_spawn.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/xla_spawn.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

install(FILES ${PROJECT_BINARY_DIR}/xla-spawn.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES ${PROJECT_BINARY_DIR}/xla-spawn.bash-completion
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions RENAME xla-spawn)

# `cpack -G DEB` (scripts/package): one package with all of the above (and one for Python). Its dependencies are
# what the binary needs at run time (dpkg-shlibdeps) and the Debian -dev packages the
# libraries' users compile and link against.
set(CPACK_PACKAGE_NAME xla-spawn)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Multi-process replicated training: launcher, shared-memory collectives, lazy runtime")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "xla-spawn developers <xla-spawn@localhost>")
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libfmt-dev, libspdlog-dev, libboost-dev, libboost-program-options-dev, zlib1g-dev, \
libgloo-dev, libopenblas-dev, libdnnl-dev, llvm-14-dev")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS bash-completion)
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)
set(CPACK_GENERATOR DEB)
if(XS_BUILD_PYTHON)
  # Two packages then: xla-spawn (all of the above) and python3-xla-spawn (the Python package,
  # install component "python"), whose torch.distributed backend links PyTorch, which only
  # the Python package's users should have to install.
  set(CPACK_DEB_COMPONENT_INSTALL ON)
  set(CPACK_COMPONENTS_ALL Unspecified python)
  set(CPACK_DEBIAN_UNSPECIFIED_PACKAGE_NAME xla-spawn)
  set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-xla-spawn)
  set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
  # The extension is built for one minor version of Python.
  math(EXPR xs_python_next_minor "${Python3_VERSION_MINOR} + 1")
  set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS
      "xla-spawn (= ${PROJECT_VERSION}), python3 (>= 3.${Python3_VERSION_MINOR}), \
python3 (<< 3.${xs_python_next_minor}), python3-numpy")
  set(CPACK_DEBIAN_PYTHON_DESCRIPTION
      "Python package of xla-spawn: collectives on NumPy arrays, a torch.distributed backend")
endif()
include(CPack)
