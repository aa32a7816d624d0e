package mongo

import ()
